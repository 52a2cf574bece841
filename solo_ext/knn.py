"""``python -m solo_ext.knn``: ``solo-ext-knn`` (``solo_ext.commands.knn``)."""

from solo_ext.commands.mains import knn as main

if __name__ == "__main__":
    main()
