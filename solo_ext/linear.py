"""``python -m solo_ext.linear``: ``solo-ext-linear`` (``solo_ext.commands.linear``)."""

from solo_ext.commands.mains import linear as main

if __name__ == "__main__":
    main()
