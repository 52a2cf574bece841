"""solo-ext's methods, one file each; ``solo_ext.registry`` registers them into the host."""
