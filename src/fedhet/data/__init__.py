"""Data: the built-in data sets, your own (arrays, .npz files, image folders), splits and augmentation.

from fedhet.data import from_arrays, from_table, register_dataset
register_dataset(from_arrays(x_train, y_train, x_test, y_test, class_names, name="clinic"))
register_dataset(from_table(frame, label="diagnosis", client="hospital", name="clinics"))
# then data.dataset = "clinic" in a config, or fedhet.run(cfg, dataset=...)
"""

from fedhet.data.datasets import (
    DATASET_NAMES,
    Dataset,
    from_arrays,
    from_table,
    load_dataset,
    register_dataset,
)

__all__ = ["DATASET_NAMES", "Dataset", "from_arrays", "from_table", "load_dataset", "register_dataset"]
