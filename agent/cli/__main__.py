"""`python -m kernel_agent.agent.cli`: the `kernel-agent` command, from a checkout that was never installed."""

import sys

from .parser import main

sys.exit(main())
