"""The launcher: a study on Cloud TPU VMs from a workstation (`python -m wide_tf.launch`, which
launch_tpu.sh runs). It checks the arguments and the config here, creates or reuses the VMs, copies
this checkout, installs it (vm_setup.sh), runs --check and the study, follows it (--watch) and
deletes what it made. It imports the schema layer alone and never TensorFlow; what runs on the VM
is in wide_tf/launch/vm/. docs/tpu.md is the guide."""
