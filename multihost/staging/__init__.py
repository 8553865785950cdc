"""Staging: what reaches the hosts before a run, and how. The code packed once and
content-addressed (``archive``), sent where it is absent, directly or through a seed or a
bucket (``via``, chosen by ``choice``), and the payloads shipped in the wheel (``bundled``)."""
