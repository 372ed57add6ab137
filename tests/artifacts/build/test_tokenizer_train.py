from __future__ import annotations

import threading

from inferd.artifacts.build import tokenizer_train


def test_the_same_arguments_train_once_and_each_caller_gets_its_own_copy(monkeypatch):
    trained = []
    train = tokenizer_train._train

    def counting(*args, **kwargs):
        trained.append(args)
        return train(*args, **kwargs)

    monkeypatch.setattr(tokenizer_train, "_trained", {})
    monkeypatch.setattr(tokenizer_train, "_train", counting)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        tokenizer_train.train_byte_level_bpe(300, num_lines=200, seed=3))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first, second = results
    assert len(trained) == 1 and first is not second
    assert first.to_str() == second.to_str()
    first.post_processor = None                  # one caller changing its copy leaves the other's alone
    assert second.encode("a b").ids[0] == second.token_to_id(tokenizer_train.BOS_TOKEN)


def test_other_arguments_train_another_tokenizer(monkeypatch):
    monkeypatch.setattr(tokenizer_train, "_trained", {})
    a = tokenizer_train.train_byte_level_bpe(300, num_lines=200, seed=3)
    b = tokenizer_train.train_byte_level_bpe(300, num_lines=200, seed=4)
    assert a.to_str() != b.to_str()
