"""R^2PO (residual rollout policy optimisation) as a training method: its stage schedule (``stages.py``), the rarity
reward of its head stage (``rarity.py``) and the method with its phases (``method.py``, :data:`~r3_rllib.r2po.method.R2PO`,
registered in :data:`r3_rllib.core.method.METHODS`). The rollout head itself is a model piece
(:mod:`r3_rllib.models.rollout_head`); its samplers are engines."""
