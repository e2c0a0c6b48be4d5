"""The model: the two towers (:mod:`.towers`), the CARE model that pairs them (:mod:`.embedder`,
``AsymmetricEmbedder``), its ``care_config.json`` (:mod:`.config`), what each side needs from a model
(:mod:`.protocols`), the encoding loop (:mod:`.encoding`), the space fingerprint (:mod:`.fingerprint`), prompts and
instructions (:mod:`.prompts`), loading from folders and the hub (:mod:`.loading`) and the baselines compared with
CARE (:mod:`.baselines`)."""
