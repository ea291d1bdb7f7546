"""Records -> cells -> member curves -> the verdict; the noise-scale prediction; the simulator.

No TensorFlow: the simulator analyses thousands of studies with NumPy and SciPy only.
"""
