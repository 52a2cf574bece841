"""``python -m solo_ext.pretrain``: ``solo-ext-pretrain`` (``solo_ext.commands.pretrain``)."""

from solo_ext.commands.mains import pretrain as main

if __name__ == "__main__":
    main()
