"""The PyTorch Function path of the attention cores (FUNCTION in ``layers.fast_path``): autograd Functions
with hand-written backward passes for the kernel attention (``kernel``, its feature maps in
``feature_maps`` and Performer's in ``random_features``), FLatten's focused attention (``focus``) and
PolaFormer's polarity features (``polarity``), with the buffer helpers they share (``buffers``). They run
where ``layers.choose_path`` picks them."""
