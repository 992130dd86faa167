"""The nccl-tests check: is the interconnect as fast as it should be.

``run`` starts ``all_reduce_perf`` (with a launcher, a timeout and live progress),
``parse`` reads its output in the current and old formats, ``interconnects`` holds the
published bus bandwidths, and ``judge`` compares the largest size's bandwidth with them.
"""
