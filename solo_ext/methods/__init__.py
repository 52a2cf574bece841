"""solo-ext's methods, one file each; ``solo_ext.methods.registry`` registers them into the host."""
