"""`python -m purplerl ...` (and `torchrun -m purplerl ...`): the same CLI as the `purplerl` script."""

from purplerl.cli import main

if __name__ == "__main__":
    main()
