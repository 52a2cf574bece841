"""solo-ext's benchmarks: loss kernels and training steps, each against references measured in
the same process, interleaved (``python -m solo_ext.bench --help``)."""
