import os
import sys

# The oracle and the family harness live next to the tests.
sys.path.insert(0, os.path.dirname(__file__))
