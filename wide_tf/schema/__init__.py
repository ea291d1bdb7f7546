"""The schema layer, what a study may be: config fields, registries, architectures and families,
the plan, the result record's schema, the study identity. Named `schema`, not `spec` (which most
developers read as a test folder).

It imports nothing else of wide_tf and no TensorFlow (tests/test_layers.py holds that), so the
config checks, the planner, the simulator and the analysis read these facts without TensorFlow.
"""
