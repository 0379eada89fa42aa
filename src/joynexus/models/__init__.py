"""The model layer: resident base model, VLAFeature, tenant action modules."""
