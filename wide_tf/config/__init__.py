"""Config files, command-line overrides and the checks made before TensorFlow starts."""
