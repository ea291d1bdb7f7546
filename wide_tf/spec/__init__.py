"""The specification layer: config fields, registries, architectures and families, the plan.

It imports nothing else of wide_tf and no TensorFlow (tests/test_layers.py holds that), so the
config checks, the planner, the simulator and the analysis read these facts without TensorFlow.
"""
