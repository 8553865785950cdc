"""The one place gcloud runs (as ``transport`` is for asyncssh): nothing else spawns it.

gcloud         the runners (sync, async), timeouts, gcloud's words read as typed errors, and
               ``Gcloud``, the client for Cloud Storage and queued resources
retry          transient failures waited out within one episode (``PatientGcloud``)
queued         ``compute tpus queued-resources`` command lines: create, delete, describe, list
tpus           the TPU VM surface: list, guest attributes, metadata updates, the IAP tunnel,
               project metadata and OS Login
storage        ``gcloud storage`` command lines
secretmanager  ``gcloud secrets`` command lines
bucket         the bucket layout (code, uv, environments, jobs)

The builders are pure (gcloud's arguments, no binary); ``tests/test_cloud_seam.py`` checks
that no module outside this package spawns gcloud, and that the real CLI parses every line.
"""
