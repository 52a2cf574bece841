"""The integration with solo-learn's own, unmodified scripts: samplers, long-tailed datasets,
the classifier stage, the Many / Medium / Few online kNN, atomic checkpoints and resumes.

solo-learn has a registry for methods only. Everything else reaches ``main_pretrain.py``,
``main_linear.py`` and ``main_knn.py`` through the start-up hook (``autoload``): right after each
solo-learn module of :data:`PATCHES` has been executed, before a script binds its names,
``patch.patch`` applies the module's patch, one module here per solo-learn module, each with
``NEEDS`` (the names of solo-learn's module it relies on, checked first: ``check``) and
``apply``. ``parsed`` keeps the parsed run, which solo-learn's loaders are called without.
``SOLO_EXT_AUTOLOAD=0`` switches all of it off, with the method registration. One patch is
not the hook's: ``backbones`` extends solo-learn's backbone table whenever solo-learn is the host
(``solo_ext.host`` applies it), since solo-ext's own commands build backbones from it too.

Nothing is imported here: the start-up hook reads this list at every interpreter start.
"""

# the solo-learn module whose import registers solo-ext's methods into its METHODS
METHODS_MODULE = "solo.methods"

# solo-learn module -> the module of this package that patches it
PATCHES = {
    "solo.args.pretrain": "args",
    "solo.args.linear": "args",
    "solo.args.dataset": "dataset_args",
    "solo.args.knn": "knn_args",
    "solo.data.pretrain_dataloader": "pretrain_dataloader",
    "solo.data.classification_dataloader": "classification_dataloader",
    "solo.data.dali_dataloader": "dali_dataloader",
    "solo.methods.linear": "linear_model",
    "solo.utils.checkpointer": "checkpointer",
    "solo.utils.auto_resumer": "auto_resumer",
}
