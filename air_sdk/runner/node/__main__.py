"""`python -m air_sdk.runner.node NODE_DIR JOB_ID NODE`: a local NodeRunner process."""

import sys

from air_sdk.runner.node.process import main

sys.exit(main())
