"""The PyTorch fast path of the attention cores: autograd Functions with hand-written backward passes for
the kernel attention (``kernel``, its feature maps in ``feature_maps`` and Performer's in
``random_features``), FLatten's focused attention (``focus``) and PolaFormer's polarity features
(``polarity``), with the buffer helpers they share (``buffers``). They run where ``layers.use_fused`` says
so and the Triton kernels (``attention.triton``) do not take the call; the plain formulas elsewhere."""
