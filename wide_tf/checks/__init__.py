"""The checks a config meets before TensorFlow starts: its file read, its command-line overrides
applied, every field and cross-field rule, the hardware fit and the dry run. Named `checks`, not
`config`, so that it is not mistaken for the top-level `configs/` of study configs."""
