import sys
from pathlib import Path

# Import the package from the source tree.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
