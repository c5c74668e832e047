"""Sealed values (``vmcp_actors.signing``): one text per sealed value."""

from __future__ import annotations

import base64

import pytest

from vmcp_actors.signing import Signer, Unsealable


def test_a_sealed_value_has_one_text_another_spelling_of_its_bytes_is_refused():
    signer = Signer.generated()
    token = signer.seal("state", {"x": 1}, 60)
    handle = signer.seal_handle("task", {"y": 2})
    assert signer.unseal("state", token) == {"x": 1} and signer.open_handle("task", handle) == {"y": 2}
    for text, opened in ((token, lambda t: signer.unseal("state", t)), (handle, lambda t: signer.open_handle("task", t))):
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        padded = base64.urlsafe_b64encode(raw).decode()
        standard = base64.b64encode(raw).decode().rstrip("=")
        for spelling in {padded, standard} - {text}:
            with pytest.raises(Unsealable):
                opened(spelling)
