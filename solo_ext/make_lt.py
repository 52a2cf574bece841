"""``python -m solo_ext.make_lt``: ``solo-ext-make-lt`` (``solo_ext.commands.make_lt``)."""

from solo_ext.commands.make_lt import main

if __name__ == "__main__":
    main()
