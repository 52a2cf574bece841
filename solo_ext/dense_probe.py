"""``python -m solo_ext.dense_probe``: ``solo-ext-dense-probe``, in ``solo_ext.commands``."""

from solo_ext.commands.mains import dense_probe as main

if __name__ == "__main__":
    main()
