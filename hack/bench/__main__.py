"""`make bench` / `make bench-plot`: `python hack/bench ...` runs this folder.

Python puts the folder itself (hack/bench) first on sys.path, so the package
``bench`` beside this file imports, and tpusim is the installed one: hack/ is not
on the path, where the folder hack/tpusim would shadow it as an empty namespace
package.
"""

import sys

from bench.cli import main

sys.exit(main())
