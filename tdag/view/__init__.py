"""view: the program for people and graph tools: ``to_networkx`` and the HTML page
(``tdag show FILE -o graph.html``)."""
from tdag.view.digraph import to_networkx
from tdag.view.page import page_html, write_page

__all__ = ["page_html", "to_networkx", "write_page"]
