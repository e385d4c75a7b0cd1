"""The page's own CSS: type readable from the back of a classroom, the projector's pinned light
theme and larger type, the full-screen chart's bare page, and the hidden preload container
(``app/ui.py`` puts each on the page)."""

CSS = """
<style>
html, body, [class*="st-"] { font-size: 18px; }
/* Readable from the back of the room: headings keep their size over the 18px body rule above. */
h1, h1 * { font-size: 2.4rem !important; font-weight: 700 !important; }
h2, h2 * { font-size: 1.75rem !important; font-weight: 650 !important; }
h3, h3 * { font-size: 1.4rem !important; font-weight: 600 !important; }
[data-testid="stMetricValue"], [data-testid="stMetricValue"] * \
{ font-size: 2.1rem !important; font-weight: 600; }
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * { font-size: 1.1rem !important; }
/* A button's label wraps between words rather than being cut ("Run the pre-class check" in a
   third of a 1366 px projector read "Run the pre-c…"); a word is never broken. */
[data-testid^="stBaseButton"] { height: auto; }
[data-testid^="stBaseButton"] div, [data-testid^="stBaseButton"] p \
{ white-space: normal !important; overflow: visible !important; text-overflow: clip !important; \
word-break: keep-all; overflow-wrap: normal; }
/* A text's table wraps its headings between words instead of scrolling a column out of view. */
[data-testid="stMarkdownContainer"] th { white-space: normal; word-break: keep-all; }
.fluxo-legend span { display: inline-block; padding: 2px 10px; margin-right: 6px; \
border-radius: 4px; color: white; font-weight: 600; }
</style>
"""

PROJECTOR_CSS = """
<style>
/* Projector: a pinned light theme (whatever the OS says) and type readable from the back row. */
html, body, [class*="st-"] { font-size: 23px; }
.stApp, [data-testid="stSidebar"], [data-testid="stHeader"], [data-testid="stMain"] \
{ background: #ffffff !important; }
.stApp [data-testid="stMarkdownContainer"], .stApp label, .stApp h1, .stApp h2, .stApp h3 \
{ color: #111111 !important; }
h1, h1 * { font-size: 3rem !important; }
[data-testid="stMetricValue"], [data-testid="stMetricValue"] * { font-size: 2.8rem !important; }
</style>
"""

CHART_ONLY_CSS = (
    "<style>[data-testid='stHeader'] { display: none; } "
    ".block-container { padding-top: 0.5rem; }</style>"
)

PRELOAD_CSS = "<style>.st-key-fluxo_preload { display: none !important; }</style>"
