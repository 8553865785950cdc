"""A pod's whole life: requests zone by zone (``lifecycle``), the pure plan of each gcloud
command line (``plan``), the records of the pods multihost made (``records``), the price table
(``prices``) and the idle pod's own deletion (``autodown``)."""
