"""``python -m tdag ...``: the ``tdag`` command line (``tdag.cli``)."""
import sys

from tdag.cli import main

if __name__ == "__main__":  # importing the package's modules (doctest collection) runs nothing
    sys.exit(main())
