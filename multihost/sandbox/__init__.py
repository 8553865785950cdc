"""Try multihost without a cloud: ``multihost sandbox up|env|down``.

N loopback hosts, each an OpenSSH ``sshd`` run as the current user (``multihost.sandbox.hosts``),
and the stand-in cloud (``multihost.sandbox.standin``: the TPU API, Cloud Storage, Secret
Manager, each VM's metadata server), served by one background process
(``multihost.sandbox.serve``) that ``multihost.sandbox.control`` starts and stops. The user's
own gcloud CLI talks to the stand-ins (``sandbox env`` points it there), so ``up``, ``run
--prefix``, ``job submit`` and ``down`` run as against Google Cloud, with no account and no
bill. A tool around the product: the product never imports it.
"""
