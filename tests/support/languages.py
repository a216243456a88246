"""Sentences in seven languages, spoken by espeak-ng in one breath with each word's true start
(:func:`tests.support.speech.synthesize_sentence`): the one measure of word timing in other languages than
English here (docs/real-speech-set.md#other-languages). Each language's eight sentences say the same
things (school, a car, the station, a book, the weather, a door, a garden, a hospital) in everyday words;
English is the control, in the voice the other sets use.
"""

from tests.support.speech import SpokenClip, synthesize_sentence

# espeak-ng's voice for each language (its voice files are named by the language's code but English's).
VOICES = {"en": "en-us", "de": "de", "nl": "nl", "fr": "fr", "es": "es", "it": "it", "pt": "pt"}
SENTENCES = {
    "en": [
        "the children walked to school in the morning",
        "my brother bought a new car last week",
        "we will meet again tomorrow at the station",
        "she reads a book every evening before bed",
        "the weather was cold and windy all day",
        "please close the door when you leave the room",
        "our neighbours have a small garden with many flowers",
        "he works at the hospital near the river",
    ],
    "de": [
        "die kinder gehen am morgen in die schule",
        "mein bruder hat letzte woche ein neues auto gekauft",
        "wir treffen uns morgen wieder am bahnhof",
        "sie liest jeden abend ein buch vor dem schlafen",
        "das wetter war den ganzen tag kalt und windig",
        "bitte schließ die tür wenn du das zimmer verlässt",
        "unsere nachbarn haben einen kleinen garten mit vielen blumen",
        "er arbeitet im krankenhaus in der nähe des flusses",
    ],
    "nl": [
        "de kinderen lopen 's ochtends naar school",
        "mijn broer heeft vorige week een nieuwe auto gekocht",
        "we zien elkaar morgen weer op het station",
        "zij leest elke avond een boek voor het slapen",
        "het weer was de hele dag koud en winderig",
        "doe alsjeblieft de deur dicht als je de kamer verlaat",
        "onze buren hebben een kleine tuin met veel bloemen",
        "hij werkt in het ziekenhuis bij de rivier",
    ],
    "fr": [
        "les enfants vont à l'école le matin",
        "mon frère a acheté une nouvelle voiture la semaine dernière",
        "nous nous retrouvons demain à la gare",
        "elle lit un livre chaque soir avant de dormir",
        "il a fait froid et venteux toute la journée",
        "ferme la porte quand tu quittes la chambre s'il te plaît",
        "nos voisins ont un petit jardin avec beaucoup de fleurs",
        "il travaille à l'hôpital près de la rivière",
    ],
    "es": [
        "los niños caminan a la escuela por la mañana",
        "mi hermano compró un coche nuevo la semana pasada",
        "nos vemos mañana otra vez en la estación",
        "ella lee un libro cada noche antes de dormir",
        "el tiempo estuvo frío y ventoso todo el día",
        "por favor cierra la puerta cuando salgas de la habitación",
        "nuestros vecinos tienen un pequeño jardín con muchas flores",
        "él trabaja en el hospital cerca del río",
    ],
    "it": [
        "i bambini vanno a scuola la mattina",
        "mio fratello ha comprato una macchina nuova la settimana scorsa",
        "ci vediamo domani alla stazione",
        "lei legge un libro ogni sera prima di dormire",
        "il tempo era freddo e ventoso tutto il giorno",
        "per favore chiudi la porta quando esci dalla stanza",
        "i nostri vicini hanno un piccolo giardino con molti fiori",
        "lui lavora all'ospedale vicino al fiume",
    ],
    "pt": [
        "as crianças vão para a escola de manhã",
        "meu irmão comprou um carro novo na semana passada",
        "nós nos encontramos amanhã na estação",
        "ela lê um livro todas as noites antes de dormir",
        "o tempo esteve frio e ventoso o dia todo",
        "por favor fecha a porta quando saíres do quarto",
        "os nossos vizinhos têm um pequeno jardim com muitas flores",
        "ele trabalha no hospital perto do rio",
    ],
}


def spoken(language: str) -> list[SpokenClip]:
    """``language``'s sentences spoken (cached on disk, as all the synthetic speech)."""
    return [synthesize_sentence(sentence, voice=VOICES[language]) for sentence in SENTENCES[language]]
