"""The relay: one small actor per Ray node (and job) between that node's agents and the controller.

Each agent long-polls its node's relay; the relay holds one long-poll at the
controller for all of them (``poll_node``) and sends their events in batches
(``report_many``). The controller then answers nodes, not ranks: a window on
1,024 ranks over 128 nodes costs ~128 calls per round, not ~1,024.
"""

from actors.relay.core import RelayCore

__all__ = ["RelayCore"]
