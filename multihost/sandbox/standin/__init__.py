"""A stand-in for Google's control plane: the TPU v2 API (queued resources, nodes, guest
attributes, OS Login, the compute project), a metadata server per TPU VM worker, Secret Manager
and fake-gcs-server, all on 127.0.0.1.

Only Google is stood in for: the real ``gcloud`` CLI talks to these servers over HTTP (pointed
at them by :func:`multihost.sandbox.standin.env.gcloud_env`), and a queued resource's workers
are real OpenSSH hosts on loopback (the sandbox's, ``multihost.sandbox.hosts``; the tests' own
fleet), where its startup script runs over real ssh. ``multihost sandbox`` serves them to a
user; the tests use them too.
"""
