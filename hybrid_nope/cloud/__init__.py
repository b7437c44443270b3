"""Job submission: gcloud command lines for Cloud TPU VMs."""
