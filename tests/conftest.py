"""One torch thread: on the 2-core CI machines the harness worker processes need the other core, and two
intra-op threads competing with them made small forwards 10-100x slower (measured)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)
