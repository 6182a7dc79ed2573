"""The `air` command line (typer + rich). Entry point: `air_sdk.cli.main:main`.

Example:
    $ air submit train.py --nodes 2 --follow -- --epochs 3
"""
