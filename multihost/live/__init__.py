"""A run watched live: every host's steps, CPU, memory and accelerator (``multihost top``),
and after the fact every host's step times as a picture (``multihost plot``)."""
