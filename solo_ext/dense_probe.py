"""``python -m solo_ext.dense_probe``: ``solo-ext-dense-probe``, in ``solo_ext.commands``."""

from solo_ext.commands.dense_probe import main

if __name__ == "__main__":
    main()
