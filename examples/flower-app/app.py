"""The Flower components of a fedhet run: the ServerApp drives the method's Strategy, every SuperNode's
ClientApp trains on its own data (its node config's ``data-dir``, or a simulation partition)."""

from pathlib import Path

from fedhet.flower.client import make_client_app
from fedhet.flower.server import make_server_app

server_app = make_server_app(app_dir=Path(__file__).parent)
client_app = make_client_app()
