"""The HTTP face: FastAPI app, auth, thin routes, and starting/stopping a gateway."""
