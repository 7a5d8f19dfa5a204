"""`python -m purplerl.cli`."""

from purplerl.cli import main

main()
