"""Graph optimizer passes and the layout transformation for NHWC EPs."""
