"""A stand-in for Google's control plane: TPU v2 queued resources, metadata servers, fake GCS.

Only Google is stood in for: the real ``gcloud`` CLI talks to these servers over HTTP, and the
startup scripts run on the real OpenSSH loopback fleet (one fleet host per TPU VM worker).
"""
