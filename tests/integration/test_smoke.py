from tests.backends import sdk_backend
from tests.gateway import backend_entry, run_client


def test_sdk_client_sees_prefixed_tools_of_two_backends(start_gateway):
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha), backend_entry("beta", beta)]})

        async def work(client):
            tools = await client.list_tools()
            result = await client.call_tool("beta_echo", {"text": "hi"})
            return [t.name for t in tools.tools], result

        names, result = run_client(gateway.url, work)
        assert "alpha_echo" in names and "beta_echo" in names
        assert result.content[0].text == "beta:hi"
