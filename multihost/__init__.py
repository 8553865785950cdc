"""multihost: run one command on every host of a multi-host accelerator job."""
