"""The web page's routes on the fake engine: served, self-contained, open without a key.

What the page does in a browser is tested in tests/integration/test_web_browser.py.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from helpers import AppFactory

from service.api.web import ASSETS, CONTENT_SECURITY_POLICY, asset_bytes


class _References(HTMLParser):
    """Every src/href in the page, and the ids it defines."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.urls.append(value)
            if name == "id" and value:
                self.ids.add(value)


def test_page_and_assets_are_served(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    refs = _References()
    refs.feed(page.text)
    local = sorted(url for url in refs.urls if not url.startswith("data:"))
    assert local == ["/ui/app.css", "/ui/app.js"]
    for url in local:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.headers["content-type"] == ASSETS[url.removeprefix("/ui/")]
        assert asset.content == asset_bytes(url.removeprefix("/ui/"))
    # The page's script looks up these elements by id; a renamed id would break it silently.
    script = client.get("/ui/app.js").text
    wanted = set(re.findall(r'\$\("([\w-]+)"\)', script))
    assert wanted and wanted <= refs.ids, wanted - refs.ids


def test_nothing_is_loaded_from_another_origin() -> None:
    for name in ("index.html", *ASSETS):
        text = asset_bytes(name).decode()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), name
        assert "@import" not in text and "localStorage" not in text and "sessionStorage" not in text, name


def test_unknown_asset_is_a_404_in_the_error_envelope(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    response = client.get("/ui/secrets.py")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "No page asset named 'secrets.py'."


def test_page_opens_without_a_key_while_the_api_needs_one(fake_client: AppFactory) -> None:
    client, _ = fake_client(access={"api_keys": ["key-one-0123456789abcdef"]})
    assert client.get("/").status_code == 200
    assert client.get("/ui/app.js").status_code == 200
    refused = client.get("/v1/backend")
    assert refused.status_code == 401
    assert "API key" in refused.json()["error"]["message"]
    assert client.get("/v1/backend", headers={"Authorization": "Bearer key-one-0123456789abcdef"}).status_code == 200


def test_page_is_not_part_of_the_openapi_schema(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(path.startswith("/ui/") for path in paths)
