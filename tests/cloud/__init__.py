"""The tests' side of the stand-in cloud: the ``cloud`` fixture (fixture.py: the package's
stand-in servers, ``multihost.sandbox.standin``, with the tests' root fleet as the TPU VMs, one
Unix user per worker), and what only tests need: the IAP relay (iap.py) and a VPC the runner
cannot reach (vpc.py).
"""
