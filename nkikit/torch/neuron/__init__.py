"""PyTorch on an emulated NeuronCore: a ``neuron`` device whose ATen ops run as NKI kernels on
nkikit's simulator, and a ``torch.compile`` backend that fuses graphs into generated kernels.
"""
