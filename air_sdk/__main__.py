"""`python -m air_sdk ...` is the `air` command (for an environment whose scripts
directory is not on PATH, e.g. a notebook's kernel or `pip install --user`)."""

from air_sdk.cli.main import main

if __name__ == "__main__":
    main()
