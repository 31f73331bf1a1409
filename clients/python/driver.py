#!/usr/bin/python3
"""Runs the conformance driver (lockd/driver.py) from the source tree, with no install."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lockd.driver import main  # noqa: E402

main()
