"""The named encoder sizes, importable without torch or transformers (the command line lists them in --help)."""

PRESETS: dict[str, dict] = {
    # Sizes from BERT (Devlin et al.) and Turc et al.'s compact BERTs; bert-small is DIET's BERT_SMALL.
    "bert-tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "bert-mini": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "bert-small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
