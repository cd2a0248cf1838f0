"""The requests layer: admission, live requests, aborts under way, request streams, the stream backlog,
statistics, sessions and replica dispatch, behind the coordinator."""
