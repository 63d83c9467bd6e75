"""Named data sets -> uint8 tensors + class names + normalization stats (DESIGN.md layout, paper-results.md
"Data available offline"; normalization stats from methods.md §1.2, §2.2, §3.2).

Lookup, for each data set, in this order (the first match wins):
  1. `root` (the CLI's --data-root DIR): first DIR/<name> (and aliases such as cifar-10 or torchvision's
     MNIST/raw, see `_specs`), then DIR itself, accepting the official file names;
  2. each directory of $FEDHET_DATA (os.pathsep-separated), the same way;
  3. known locations: /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist) and the
     repository's sibling ../shared/data (and /work/shared/data).
Inside one directory the exact official formats are preferred over the JPEG copy of CIFAR-10.

Images decoded from image folders/tars (CIFAR-10 JPEG, CINIC-10, Tiny-ImageNet) are cached as .npy under
$FEDHET_CACHE (default ~/.cache/fedhet)/datasets/, keyed by the source's absolute path, size and mtime;
the cache is safe to delete. digits is scikit-learn's 8x8 set with a fixed split (see `_load_digits`).

Layout: ``dataset`` (the :class:`Dataset`), ``catalog`` (the named data sets and their official layouts),
``locations`` (where they are looked for), ``cache`` (decoded image folders), ``user_data`` (arrays,
registered data sets, .npz files, image folders), ``loading`` (:func:`load_dataset`, :func:`dataset_status`).
"""

from fedhet.data.datasets.cache import cache_root
from fedhet.data.datasets.catalog import DATASET_NAMES, USER_FORMATS
from fedhet.data.datasets.dataset import Dataset, to_tensor
from fedhet.data.datasets.loading import dataset_status, load_dataset
from fedhet.data.datasets.locations import shared_data_file
from fedhet.data.datasets.tables import from_table

# The live registry of user data sets: the simulation asks it whether a name is registered.
from fedhet.data.datasets.user_data import _REGISTERED as _REGISTERED
from fedhet.data.datasets.user_data import from_arrays, load_local_data, register_dataset

__all__ = [
    "DATASET_NAMES",
    "USER_FORMATS",
    "Dataset",
    "cache_root",
    "dataset_status",
    "from_arrays",
    "from_table",
    "load_dataset",
    "load_local_data",
    "register_dataset",
    "shared_data_file",
    "to_tensor",
]
