"""Pure readers for the official file formats of the data sets fedhet knows.

Spec: paper-results.md, "Data available offline".

Each reader takes paths and returns numpy arrays: images uint8 in (N, C, H, W) order, built in that layout
directly; labels int64 (N,). Malformed files raise `DataError` naming the file and what is wrong with it.
Containers: a directory, a zip archive, or a tar archive (plain, .gz, .bz2 or .xz); members are read in
sorted name order. Official pickles (CIFAR python batches) go through a restricted unpickler.

Layout: ``arrays`` (:class:`Arrays`, shared checks), ``containers`` (directory, zip, tar), then one module per
format: ``idx`` (MNIST, Fashion-MNIST, EMNIST), ``cifar`` (python batches, through ``unpickle``),
``images`` (image folders, CINIC-10, Tiny-ImageNet), ``svhn`` (.mat), ``npz`` (the user's own arrays).
"""

from fedhet.data.formats.arrays import Arrays
from fedhet.data.formats.cifar import CIFAR10_CLASSES, read_cifar_python
from fedhet.data.formats.idx import read_emnist, read_idx, read_idx_dataset
from fedhet.data.formats.images import IMAGE_EXTENSIONS, read_cinic10, read_image_folder, read_tiny_imagenet
from fedhet.data.formats.npz import arrays_from, read_npz
from fedhet.data.formats.svhn import read_svhn, read_svhn_mat
from fedhet.data.formats.unpickle import restricted_loads

__all__ = [
    "CIFAR10_CLASSES",
    "IMAGE_EXTENSIONS",
    "Arrays",
    "arrays_from",
    "read_cifar_python",
    "read_cinic10",
    "read_emnist",
    "read_idx",
    "read_idx_dataset",
    "read_image_folder",
    "read_npz",
    "read_svhn",
    "read_svhn_mat",
    "read_tiny_imagenet",
    "restricted_loads",
]
