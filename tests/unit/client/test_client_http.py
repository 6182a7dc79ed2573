"""Retries, backoff and error translation of the client, over a fake network."""

from __future__ import annotations

import pytest
import requests

from air_sdk.client import Client, _http
from air_sdk.client._http import mock_response, mock_session
from air_sdk.errors import (
    ApiError,
    AuthError,
    ConflictError,
    IdempotencyError,
    NotFoundError,
    RateLimitedError,
    TransportError,
)

URL = "http://gw.test:8470"
HEALTH = {"status": "ok", "version": "9.9.9"}


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every backoff the client asks for, instead of sleeping it."""
    asked: list[float] = []
    monkeypatch.setattr(_http, "_sleep", asked.append)
    return asked


def scripted(*answers: requests.Response | BaseException) -> tuple[Client, list]:
    """A client whose n-th request gets the n-th answer (an exception is raised)."""
    seen: list[requests.PreparedRequest] = []
    queue = list(answers)

    def handler(request: requests.PreparedRequest) -> requests.Response:
        seen.append(request)
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return Client(URL, token="tok", session=mock_session(handler), max_attempts=4), seen


def test_retries_503_then_succeeds(waits: list[float]) -> None:
    client, seen = scripted(
        mock_response(503, {"detail": "busy"}),
        mock_response(503, {"detail": "busy"}),
        mock_response(200, HEALTH),
    )
    assert client.health().version == "9.9.9"
    assert len(seen) == 3
    assert len(waits) == 2 and all(0 <= w <= _http.BACKOFF_MAX_S for w in waits)


def test_retry_after_is_honoured(waits: list[float]) -> None:
    client, _ = scripted(
        mock_response(429, {"detail": "slow down"}, headers={"Retry-After": "7"}),
        mock_response(200, HEALTH),
    )
    client.health()
    assert waits == [7.0]


def test_rate_limited_after_all_attempts(waits: list[float]) -> None:
    client, seen = scripted(*[mock_response(429, {"detail": "too many"}) for _ in range(4)])
    with pytest.raises(RateLimitedError, match="too many"):
        client.health()
    assert len(seen) == 4 and len(waits) == 3


@pytest.mark.parametrize(
    "text",
    [
        # urllib3 2 quotes the inner error with ", urllib3 1 with '
        "HTTPConnectionPool(host='gw.test', port=8470): Max retries exceeded with url: /v1/jobs "
        "(Caused by NewConnectionError(\"HTTPConnection(host='gw.test', port=8470): Failed to "
        'establish a new connection: [Errno 111] Connection refused"))',
        "HTTPConnectionPool(host='gw.test', port=8470): Max retries exceeded (Caused by "
        "NewConnectionError('<conn>: Failed to establish a new connection: [Errno 111] "
        "Connection refused'))",
    ],
)
def test_a_refused_connection_is_said_at_once_without_retries(
    waits: list[float], text: str
) -> None:
    refused = requests.ConnectionError(text)
    client, seen = scripted(*[refused] * 4)
    with pytest.raises(TransportError) as info:
        client.jobs()
    message = str(info.value)
    assert message == (
        f"could not reach the gateway at {URL}: Connection refused;"
        " start one with `air gateway start`"
    )
    assert isinstance(info.value.__cause__, requests.ConnectionError)
    assert len(seen) == 1 and waits == []  # nothing listens: no point in waiting


def test_a_real_refused_socket_is_recognised() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(requests.ConnectionError) as info:
        requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=5)
    assert _http.is_refused(info.value)


def test_a_reset_connection_is_retried(waits: list[float]) -> None:
    reset = requests.ConnectionError("('Connection aborted.', ConnectionResetError(104))")
    client, seen = scripted(reset, reset, mock_response(200, HEALTH))
    assert client.health().version == "9.9.9"
    assert len(seen) == 3 and len(waits) == 2


def test_sends_token_and_user_agent(waits: list[float]) -> None:
    import air_sdk

    client, seen = scripted(mock_response(200, HEALTH))
    client.health()
    assert seen[0].headers["Authorization"] == "Bearer tok"
    assert seen[0].headers["User-Agent"] == f"air-sdk/{air_sdk.__version__}"
    assert seen[0].url == f"{URL}/v1/health"


@pytest.mark.parametrize(
    ("status", "detail", "error_class"),
    [
        (404, "no job j-1", NotFoundError),
        (409, "attempt 2 is stale", ConflictError),
        (422, "Idempotency-Key k was used with another body", IdempotencyError),
        (422, "nodes must be >= 1", ApiError),
        (400, "bad state filter", ApiError),
    ],
)
def test_error_statuses_map_to_specific_classes(
    waits: list[float], status: int, detail: str, error_class: type[ApiError]
) -> None:
    client, seen = scripted(mock_response(status, {"detail": detail}))
    with pytest.raises(error_class) as info:
        client.jobs()
    assert type(info.value) is error_class
    assert info.value.status == status
    assert detail in str(info.value)
    assert len(seen) == 1 and waits == []  # never retried


@pytest.mark.parametrize(
    "answer",
    [
        mock_response(401, {"detail": "the token is not valid (revoked, or for another gateway)"}),
        mock_response(401),  # a HEAD (the bundle check of a submit) has no body
    ],
)
def test_a_refused_token_is_one_message_on_every_route(
    waits: list[float],
    answer: requests.Response,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("AIR_CONFIG_FILE", str(config))
    monkeypatch.delenv("AIR_TOKEN", raising=False)
    client, _ = scripted(answer)
    with pytest.raises(AuthError) as info:
        client.jobs()
    assert str(info.value) == (
        f"the gateway at {URL} does not accept the token given (revoked, or issued by another"
        " gateway): give a token this gateway issued (HTTP 401)"
    )


def test_a_refused_token_from_the_env_or_config_says_what_to_do(
    waits: list[float], monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'gateway_url = "{URL}"\ntoken = "stale"\n')
    monkeypatch.setenv("AIR_CONFIG_FILE", str(config))
    monkeypatch.delenv("AIR_TOKEN", raising=False)

    def refuse(request: requests.PreparedRequest) -> requests.Response:
        return mock_response(401, {"detail": "the token is not valid"})

    with pytest.raises(AuthError) as info:
        Client(session=mock_session(refuse)).jobs()
    assert str(info.value) == (
        f"the gateway at {URL} does not accept the token in {config} (revoked, or issued by"
        " another gateway): `air gateway start` rewrites it for the gateway on this machine;"
        " for another, set AIR_TOKEN to a token it issued (`air admin token create`) (HTTP 401)"
    )
    monkeypatch.setenv("AIR_TOKEN", "wrong")
    with pytest.raises(AuthError, match="the token in AIR_TOKEN .* or unset it to use the one in"):
        Client(session=mock_session(refuse)).jobs()


def test_an_empty_air_token_means_unset(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'gateway_url = "{URL}"\ntoken = "from-config"\n')
    monkeypatch.setenv("AIR_CONFIG_FILE", str(config))
    monkeypatch.setenv("AIR_TOKEN", "")
    seen: list[requests.PreparedRequest] = []
    client = Client(session=mock_session(lambda r: seen.append(r) or mock_response(200, HEALTH)))
    client.health()
    assert seen[0].headers["Authorization"] == "Bearer from-config"


def test_validation_error_list_is_readable(waits: list[float]) -> None:
    body = {
        "detail": [
            {"loc": ["body", "resources", "nodes"], "msg": "Input should be >= 1", "type": "x"},
            {"loc": ["query", "limit"], "msg": "not an int", "type": "y"},
        ]
    }
    client, _ = scripted(mock_response(422, body))
    with pytest.raises(ApiError) as info:
        client.jobs()
    assert info.value.message == "resources.nodes: Input should be >= 1; limit: not an int"


def test_non_json_error_body_is_shown(waits: list[float]) -> None:
    client, _ = scripted(mock_response(500, content="upstream exploded"))
    with pytest.raises(ApiError, match="upstream exploded"):
        client.health()


def test_unexpected_answer_is_an_api_error(waits: list[float]) -> None:
    client, _ = scripted(mock_response(200, {"hello": "world"}))
    with pytest.raises(ApiError, match="not a Health"):
        client.health()


def test_state_filter_goes_on_the_wire_by_value(waits: list[float]) -> None:
    from air_sdk.schema import JobState

    client, seen = scripted(mock_response(200, {"jobs": []}))
    assert client.jobs(state=JobState.RUNNING, limit=5) == []
    assert seen[0].url == f"{URL}/v1/jobs?state=RUNNING&limit=5"


def test_parse_retry_after_http_date_and_cap() -> None:
    assert _http.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert _http.parse_retry_after("3600") == _http.MAX_RETRY_AFTER_S
    assert _http.parse_retry_after("soon") is None
